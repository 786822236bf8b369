"""The device process (``splitfl device``, :mod:`.cli`): the agent that holds the clients'
parts and data (:mod:`.agent`, :mod:`.aux_commands`), its connection to the server (:mod:`.session`,
:mod:`.workers`, :mod:`.refusals`), its device-to-device sessions (:mod:`.clusters`,
:mod:`.ring`), a family's own commands (:mod:`.ushaped`, registered here) and emulated
heterogeneity (:mod:`.emulation`)."""

from splitfl.net.device import ushaped  # noqa: F401  (fills agent.EXTRA_COMMANDS)
