"""An object store for rllm-core in an S3 bucket.

The entry module is :mod:`rllm_object_store_s3.plugin`.
"""
