import sys

from splitfl.cli.main import main

sys.exit(main())
