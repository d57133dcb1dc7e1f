"""Bridges to other RL frameworks. Nothing here is imported by ``import mindspeed_rl_asp``;
each bridge imports its framework only inside the functions that need it."""
