"""Fault campaigns: many trials, faults at random moments, a checker that judges every history.

chaos.py: local runs; nemesis.py: the controller in the loop on the kwok test bed;
nemesis_real_pods.py: the same on real pods.
"""
