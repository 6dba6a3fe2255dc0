import sys

from routeaudit.cli import main

sys.exit(main())
