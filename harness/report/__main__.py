"""`python -m harness.report RUN_DIR...`: (re)write each run's report.html."""
import sys

from harness.report.page import main

sys.exit(main())
