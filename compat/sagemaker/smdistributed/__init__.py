"""SageMaker's import paths, provided by torch-smddp (torch-smddp-sagemaker)."""
