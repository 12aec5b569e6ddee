"""The contract between the stages: the Avro schemas (`*.v<N>.avsc`) and the one codec that writes and reads them.

The codec's modules, each importing only those listed before it:
  single_object.py      single-object encoding of any record: marker, fingerprints, the schema registry, encode/decode
  packed_stacks.py      PackedStacks, a process's stacks held columnar
  cpu_batch_layout.py   the CpuStackBatch layout derived from its schema file, for the two fast paths below
  cpu_batch_writer.py   the fast CpuStackBatch writer (split under the message size limit)
  cpu_batch_reader.py   the columnar CpuStackBatch reader
  gpu_launch_writer.py  the fast GpuLaunch writer
topics.py lists the Kafka topics and the record each carries.
"""
