#!/usr/bin/env bash
# The architecture review's counts (../shared/design/architecture-review-2026-12-01.md,
# Appendix A) for one revision:  bash benchmarks/architecture_counts.sh [REV]  (default: the
# working tree). Each line is "count<TAB>what", the command being the line that prints it.
set -euo pipefail
rev="${1:-}"
if [ -n "$rev" ]; then
  root="$(mktemp -d)"; trap 'rm -rf "$root"' EXIT
  git archive "$rev" src | tar -x -C "$root"
  cd "$root"
fi
S=src/splitfl
count() { printf '%s\t%s\n' "$1" "$2"; }
count "$(python3 -c "import ast,dataclasses;t=ast.parse(open('$S/core/plan.py' if __import__('os').path.exists('$S/core/plan.py') else '$S/plan.py').read());c=[n for n in t.body if isinstance(n,ast.ClassDef) and n.name=='RoundPlan'][0];print(sum(1 for n in c.body if isinstance(n,ast.AnnAssign) and getattr(n.target,'id','_')!='_'))")" "RoundPlan fields"
count "$( (grep -rnoE "plan\.(server_mode|group_loss|device_grad|order|server_lr|device_loss|aux|upload_every|upload_phase|align|mixup_alpha|chain_devices|ring|group_forward|hosts|round_idx|uploads)\b" $S/executors $S/net || true) | wc -l)" "plan-flag reads in executors/ and net/ (the review's regex; after: plan.aux/device_loss are properties of device_update, round_idx and uploads stay)"
count "$( (grep -rnoE "isinstance\([a-z_.]*topology" $S/executors $S/net || true) | wc -l)" "payload type tests in executors/ and net/ (the rest dispatch through topologies.family_of)"
count "$( (grep -rnoE "family_of\(" $S/executors $S/net $S/experiment || true) | wc -l)" "family dispatches in the runtimes and the round step"
count "$( (grep -rnE "def (client_cost|round_time|share_links|idle_costs)\(" $S/algorithms || true) | grep -v base.py | wc -l)" "cost-hook overrides in algorithms"
count "$( (grep -rno 'ctx\.[a-z_]*' $S/algorithms || true) | wc -l)" "ctx reads in algorithms"
count "$(python3 -c "import ast;t=ast.parse(open('$S/algorithms/base.py').read());c=[n for n in t.body if isinstance(n,ast.ClassDef) and n.name=='Algorithm'][0];print(sum(1 for n in c.body if isinstance(n,(ast.FunctionDef,ast.AnnAssign,ast.Assign))))")" "Algorithm members"
count "$( (grep -rn "resolve_algorithm(" $S/experiment || true) | wc -l)" "resolve_algorithm calls in experiment/"
count "$(ls $S/*.py | grep -vcE '__init__|__main__')" "loose top-level modules"
count "$( (grep -rlE "RingSpec|plan\.ring|ring_client_cost|ring_makespan|RING_MEMBER_FAILED|ring_batch_update" $S || true) | wc -l)" "files naming the ring family"
count "$( (grep -rlE "AuxSpec|AlignSpec|plan\.aux|aux_state|head_update|estimate_update|AuxCharge|build_aux" $S || true) | wc -l)" "files naming the auxiliary family"
count "$(ls -d $S/topologies/*/ $S/topologies/*.py 2>/dev/null | grep -vcE '__init__|base.py|split.py|__pycache__' || true)" "topology family modules/packages"
