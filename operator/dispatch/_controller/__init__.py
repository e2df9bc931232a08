"""The Kubernetes operator: one loop supervising every DispatchJob, the webhooks, the CRD, the CLI.

Importing this package imports nothing heavy; ``dispatch._controller.main`` starts the operator.
"""
