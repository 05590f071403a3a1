import sys

from ratekeeper.cli import main

sys.exit(main())
