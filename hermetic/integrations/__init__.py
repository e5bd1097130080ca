"""What hermetic's runs look like to other tools: MLflow (``mlflow.py``, the extra ``hermetic[mlflow]``)."""
