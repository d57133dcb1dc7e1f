#!/usr/bin/env bash
# Launch layout ascend_a3_t2g2 (mode=async). Prints each node's command by default:
#   bash scripts/launch/ascend_a3_t2g2.sh head=HEAD_IP                  # dry run: all commands
#   bash scripts/launch/ascend_a3_t2g2.sh head=HEAD_IP --node K         # on node K: ray start (head first)
#   bash scripts/launch/ascend_a3_t2g2.sh head=HEAD_IP --wait           # on node 0: wait until every node joined with its NPUs
#   bash scripts/launch/ascend_a3_t2g2.sh head=HEAD_IP --driver [overrides]   # on node 0: wait, then the driver
#   bash scripts/launch/ascend_a3_t2g2.sh head=HEAD_IP --driver --mindspeed-config JOB.yaml   # a MindSpeed-RL job
# Nothing here stops or kills processes: `ray stop` on a node is the operator's call.
exec asp-launch layout=ascend_a3_t2g2 mode=async "$@"
