from .._extras import pb_main

pb_main()
