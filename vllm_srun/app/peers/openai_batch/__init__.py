"""OpenAI's Batch API (/v1/files, /v1/batches) onto the bulk jobs: a batch is one job.

`lines` reads an input file and writes output and error lines; `files` and `batches` are the
routes.
"""
