package txjoin.submit;

import org.apache.spark.deploy.PythonRunner;

/**
 * The main class of txjoin as a JVM application, for a standalone master's cluster mode.
 *
 * <p>spark-submit refuses a Python application in cluster mode on a standalone master
 * ("Cluster deploy mode is currently not supported for python applications on standalone
 * clusters"), while it runs a JVM application there, with {@code --supervise} restarting a
 * driver that fails. This class is such an application: in the driver the master starts on
 * a worker, it runs the Python driver as spark-submit does in client mode, through Spark's
 * own {@link PythonRunner} (a py4j gateway in this JVM, the Python process its child, whose
 * exit code is the driver's, so a failed Python driver is a failed, restarted driver).
 *
 * <p>Arguments: the Python file to run (txjoin's {@code txjoin/submit.py}, a local path on
 * the worker), then its own arguments. The interpreter is {@code spark.pyspark.python}.
 */
public final class PythonDriver {
    private PythonDriver() {}

    public static void main(String[] args) {
        if (args.length < 1) {
            throw new IllegalArgumentException(
                "txjoin.submit.PythonDriver: expected the Python file to run (txjoin/submit.py) "
                + "and its arguments");
        }
        String[] runner = new String[args.length + 1];
        runner[0] = args[0];
        runner[1] = ""; // PythonRunner's --py-files: none, the environment holds txjoin
        System.arraycopy(args, 1, runner, 2, args.length - 1);
        PythonRunner.main(runner);
    }
}
