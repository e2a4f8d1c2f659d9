"""MXNet's parameter servers (ps-lite), both sides of the wire.

- ``link``: a client group's master talking to the servers (``ServerLink``), and where
  each key lives among ps-lite's keys (the key layout: pieces of tables, packs);
- ``packs``: small dense keys packed into one ps-lite key (the master's half);
- ``server``: what runs inside a server: kvhybrid's optimizer, packs, checkpoints;
- ``node``: the scheduler and server entry point, ``python -m kvhybrid.kvstore.ps.node``;
- ``auth``: the job's secret and the signed commands the servers accept.

Importing this package (or ``auth``) loads no MXNet: the launcher needs ``auth``.
"""
