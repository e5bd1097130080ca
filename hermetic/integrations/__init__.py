"""What hermetic's runs look like to other tools: MLflow (``mlflow.py``).

It imports its optional package (``hermetic[mlflow]``) on first use only, so
no other command pays for it; when it is missing the error names the extra
to install (hermetic.core.errors.MissingExtra, exit 69).
"""
