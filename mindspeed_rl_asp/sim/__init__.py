"""Discrete-event cluster simulator: the real control core and planners on a virtual clock."""
