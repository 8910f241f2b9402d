import sys

from ccbridge.cli import main

sys.exit(main())
