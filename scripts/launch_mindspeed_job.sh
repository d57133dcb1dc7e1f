#!/usr/bin/env bash
# Launch a MindSpeed-RL GRPO / DAPO job (its own YAML) on the layout its import makes from
# rl_config.actor_resource.num_npus (docs/mindspeed_rl.md, sections 2 and 3). Prints each node's
# command by default:
#   bash scripts/launch_mindspeed_job.sh JOB.yaml head=HEAD_IP                    # dry run: all commands
#   bash scripts/launch_mindspeed_job.sh JOB.yaml head=HEAD_IP --node K           # on node K: ray start (head first)
#   bash scripts/launch_mindspeed_job.sh JOB.yaml head=HEAD_IP --wait             # on node 0: wait for every node's NPUs
#   bash scripts/launch_mindspeed_job.sh JOB.yaml head=HEAD_IP --driver [overrides]   # on node 0: wait, then the driver
# Overrides steer the layout (layout.devices_per_node=16, layout=NAME, mode=hybrid) and the run.
# With MINDSPEED_RL_CHECKOUT set (MindSpeed-RL's checkout, the same path on every node) every
# ray start and the driver get it; the job's HCCL_BUFFSIZE goes to the driver unless you set it.
# Nothing here stops or kills processes: `ray stop` on a node is the operator's call.
set -euo pipefail
job="${1:?usage: launch_mindspeed_job.sh JOB.yaml head=HEAD_IP [--node K | --wait | --driver] [overrides]}"
shift
exec asp-launch --mindspeed-config "$job" "$@"
