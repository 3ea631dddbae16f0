"""The serving simulator (issue #22): the real engine on simulated hardware, in virtual time."""
