"""Abstract conformance suites, one module per component kind.

A plugin's test module subclasses the suite class for its kind and provides the fixtures that
class documents; pytest then runs every ``test_*`` method of the suite against the plugin. The
classes are not named ``Test*``, so they are never collected on their own.
"""
