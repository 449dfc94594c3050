import sys

from freetoken.cli.main import main

sys.exit(main())
