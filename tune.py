def main():
    raise SystemExit("tune.py: not implemented yet")
