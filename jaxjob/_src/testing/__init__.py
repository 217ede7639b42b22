"""The fault-injection kit, public as ``jaxjob.testing``: kill jobs at fail points, compare runs.

May import any layer.
"""
