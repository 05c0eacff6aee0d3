# Placeholder: the image that Ray head and workers run (Ray + spotray's train/ and jobs/)
# is issue #7: pinned versions, non-root, multi-stage, linted by hadolint in the tests.
# This file builds nothing yet; do not use it.
