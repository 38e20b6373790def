"""The Kubernetes operator: the RLJob CRD, pure builders of every child object, and the
kopf handlers over them (`streamrl operator`)."""
