"""MergeSFL (Liao et al.): the algorithm (:mod:`.algorithm`) and its §IV-A control modules —
Alg. 1 end to end (:mod:`.arrangement`), batch sizes and times (:mod:`.batch_sizes`, Eq. 7-9),
worker selection (:mod:`.selection`, Eq. 10-13) and batch-size fine-tuning (:mod:`.finetune`,
Eq. 14). Worker state estimation (Eq. 5-6) is shared with AdaSFL:
:mod:`splitfl.algorithms.state_estimation`."""

from splitfl.algorithms.mergesfl.algorithm import MergeSFL, MergeSFLOptions

__all__ = ["MergeSFL", "MergeSFLOptions"]
