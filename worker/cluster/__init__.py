"""Redis Cluster support: protocol version 2's sharded key layout and the cluster client."""
