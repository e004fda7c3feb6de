"""How ranks meet: discovery, Slurm, hostfiles, network interfaces, rendezvous, faults, the process group."""
