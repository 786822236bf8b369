"""ParallelSFL (Liao et al.): the algorithm (:mod:`.algorithm`) and its §4.3-4.5 control
modules — one round's clustering problem (:mod:`.problem`, Eq. 8-14), label sets and greedy
top/bottom assignment (:mod:`.clustering`, Alg. 1 lines 1-10), swap fine-tuning
(:mod:`.finetune`, line 11), local frequencies and weights (:mod:`.frequency`, Eq. 15-18) and
the whole round's pipeline (:mod:`.planner`)."""

from splitfl.algorithms.parallelsfl.algorithm import ParallelSFL, ParallelSFLOptions

__all__ = ["ParallelSFL", "ParallelSFLOptions"]
