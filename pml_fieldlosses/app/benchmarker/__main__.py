from ..entry_points import pb_main

pb_main()
