"""Scale-out on Ray Serve (docs/scaling.md): ``realtime serve --replicas N``.

Ray is an optional extra; the modules that import it are imported only by ``realtime serve
--replicas`` and by Serve itself:

- ``launch``: the commands (``serve --replicas``: a local Ray instance or a cluster, the ingress,
  Serve's proxy behind it, the app, readiness; ``drain``: move a replica's sessions to the others);
- ``replica``: the Serve deployment (the server's app per replica, its routing report, peers, the
  address of its own server for the ingress);
- ``router``: the session router (Serve's ``RequestRouter``) Serve runs in its proxies and in the
  ingress's handle;
- ``checkpoints``: the checkpoint store (a detached Ray actor) for resumable session state.

Ray-free, so they are testable alone: ``ingress`` (the server's address: each websocket placed by
the session router through one handle call, then relayed byte for byte to its replica's own
server; the rest to Serve's proxy), ``direct`` (a replica's own server for those websockets),
``affinity`` (what a request names and opens), ``placement`` (the placement policy), ``views`` (the cluster-wide ``/readyz``, ``/metrics``,
``/v1/models``, ``/v1/status``), ``session_check`` (a gone replica's session: its checkpoint to the
kind, or ``session_not_found``), ``proxy`` (close 1012 when a replica dies, in Serve's proxy),
``resume`` (what each kind checkpoints, the replica's ``Checkpointer``, the store's table).
"""
