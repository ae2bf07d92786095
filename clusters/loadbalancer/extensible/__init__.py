"""The pure core of Pulsar's extensible load manager (ExtensibleLoadManagerImpl, PIP-192).

No I/O, no asyncio, no wall clock (time is a `now_ms` parameter), randomness only through a
`random.Random` the caller passes: the broker, the channel checker (which replays the whole channel
topic) and a discrete-event simulator call the same code and get the same answers.

- `state`: the service-unit states, the valid transitions, `ServiceUnitStateData` and its JSON, the
  conflict resolver (`should_keep_left`) and `ChannelView` (the table view every broker keeps).
- `handlers`: what a broker does on an accepted channel message; `get_owner`; the event builders.
- `monitor`: the leader's ownership monitor and `override_ownership`.
- `load_data`: `BrokerLoadData` (EMAs), the reporter's change rule, `TopKBundles`, assignment.
- `transfer_shedder`: TransferShedder with its load statistics and hit count.
- `split_scheduler`: SplitScheduler's per-cycle choice of bundles to split.
"""
