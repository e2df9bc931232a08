"""The Kubernetes operator: kopf handlers supervising DispatchJobs, the CRD, the command line.

Importing this package imports nothing heavy; ``dispatch._kube.main`` starts the operator.
"""
