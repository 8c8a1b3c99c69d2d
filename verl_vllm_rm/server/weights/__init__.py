"""server/weights"""
