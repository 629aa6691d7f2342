"""The ``harbor`` task source: Harbor-format task directories graded by their verifiers."""
