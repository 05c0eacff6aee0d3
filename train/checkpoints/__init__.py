"""The checkpoint format and the one definition of complete, its upload from one or several nodes, and the resume."""
