from .kit import main

main()
