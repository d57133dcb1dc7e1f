#!/usr/bin/env bash
# Launch layout ascend910b3_t4g1 (mode=async). Prints each node's command by default:
#   bash scripts/launch/ascend910b3_t4g1.sh head=HEAD_IP                  # dry run: all commands
#   bash scripts/launch/ascend910b3_t4g1.sh head=HEAD_IP --node K         # on node K: ray start
#   bash scripts/launch/ascend910b3_t4g1.sh head=HEAD_IP --driver [overrides]   # on node 0, after all nodes joined
exec asp-launch layout=ascend910b3_t4g1 mode=async "$@"
