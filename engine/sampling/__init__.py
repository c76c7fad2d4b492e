"""The samplers (host_sampler, device_sampler) behind one interface (interface.py), one idea per file."""
