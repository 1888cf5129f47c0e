"""What the machine gives: CPUs the container really has (``cpus``), memory and its limits
(``memory``, ``memlimit``: cgroup v1 and v2), and the distributed world and rank (``world``)."""
