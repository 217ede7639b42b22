import os
import sys

sys.path.insert(0, os.path.dirname(__file__))

from cloud_servers import (  # noqa: E402,F401  (session fixtures: real local object stores)
    cloud_servers,
    gcs_bucket,
    gcs_prefix,
    s3_bucket,
    s3_prefix,
)
