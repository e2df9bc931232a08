"""The Kubernetes operator: kopf handlers supervising DispatchJobs, the CRD, the command line.

Importing this package imports nothing heavy; ``dispatch._controller.main`` starts the operator.
"""
