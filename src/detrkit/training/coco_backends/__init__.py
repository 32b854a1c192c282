"""COCO evaluator packages behind OnePassCocoMeanAveragePrecision, one file per package."""
