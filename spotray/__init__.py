"""spotray's command line and local mode: the user's side of the project."""
