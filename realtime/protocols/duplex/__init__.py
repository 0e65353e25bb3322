"""The duplex voice protocol, sans-I/O (docs/protocols/duplex.md): OpenAI Realtime events plus
additive duplex events, on ``/v1/duplex`` and ``/v1/realtime?mode=duplex``.

A stock OpenAI Realtime client still hears the model and sees its transcript: the response
envelope is OpenAI's (``response.created`` ... ``response.output_audio.delta`` ...
``response.done``), written by the OpenAI codec's own event classes. What duplex adds:

- ``epoch`` and ``server_event_seq`` on every server event (``codec.DuplexCodec.render``);
- ``response.speak`` / ``response.listen`` (the model's own turn decisions), barge-in, and a
  playback ledger: ``playback.ack {response_id, played_ms}`` commits history only up to what the
  client played (``turns.Turns``);
- resume: ``session.resume {session_id, resume_token, last_received_server_event_seq}`` replays
  the bounded journal exactly (``journal.Journal``); ``session.replaced``, ``session.expired``,
  ``session.heartbeat``;
- Ogg/Opus audio in binary frames, negotiated at connect (``opus``).

Modules, each with one job: ``commands`` (the duplex client events, typed), ``codec`` (text or
bytes in -> command out; event in -> frame out), ``events`` (the duplex server events),
``journal`` (the replay journal), ``turns`` (model steps -> response events, the playback ledger
and history), ``opus`` (Ogg/Opus pages <-> PCM, in memory).
"""
