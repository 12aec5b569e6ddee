from fleetprof.cli import main

main()
