"""The server process of a networked run (``executor: networked``): the executor
(:mod:`.executor`), its fleet of remote device parts (:mod:`.fleet`), the session that starts
the hub and local devices (:mod:`.session`), device-to-device rounds (:mod:`.clusters`,
:mod:`.ring`), lateness (:mod:`.lateness`), device-side data calls (:mod:`.client_data`) and a
test bed with devices in threads (:mod:`.testbed`)."""
