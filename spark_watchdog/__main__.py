import sys

from spark_watchdog.cli.main import main

sys.exit(main())
