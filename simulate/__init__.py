"""Simulators and load generators, kept apart from the production packages: the synthetic fleet behind
`fleetprof loadgen`, and the simulated GPU, its workload and the simulated libnvidia-ml.so.1 behind
`fleetprof up --simulate-gpu` and the GPU tests. Everything they produce is labelled simulated."""
