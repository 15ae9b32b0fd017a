"""Training: the loop (`loop.train`, one process; `mpi.train_mpi`, one process per device),
experiment configs, sharded checkpoints and run reports. The `jaxhc` command line drives them."""
