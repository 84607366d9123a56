from bench.scale.runner import main

main()
