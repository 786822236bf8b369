import sys

from splitfl.cli.entry import main

sys.exit(main())
