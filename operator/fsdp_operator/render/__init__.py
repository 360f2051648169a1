"""Objects from specs: worker pods and Services (templates, podmerge) and the CRDs themselves.
Pure. Imports `policy` and `types`.
"""
