"""server/score"""
