import sys

from medattn.cli import main

sys.exit(main())
