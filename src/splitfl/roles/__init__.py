"""The two roles of one split iteration and what every training pattern shares.

A device's part and a group's server copy (:mod:`.sides`: :class:`DeviceRole`,
:class:`ServerRole`), the fleet a server drives its devices through and the split iteration
(:mod:`.fleet`), the pool of reusable model parts (:mod:`.parts`), the auxiliary-model
numerics the roles run (:mod:`.aux_numerics`) and the shared helpers (:mod:`.common`: batches,
optimisers, finiteness). Plain torch: used in-process, in parallel workers and on devices.
The patterns' schedules over these roles are the topology families (:mod:`splitfl.topologies`).
"""
